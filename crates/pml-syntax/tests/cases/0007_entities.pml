<schema name="entities">
  <module name="a&amp;b" note="&quot;quoted&quot; &apos;single&apos; &#x41;&#66;">
    &lt;tag&gt; &amp; more: &#9731; &#x1F600; a && b, &mut x
  </module>
</schema>
