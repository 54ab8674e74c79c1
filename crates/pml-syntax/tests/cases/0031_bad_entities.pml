<schema name="e">
  <module name="m" title="&bogus; &#xZZ;">
    &nbsp; &lt &#0; &#1114112; &#; fine: &amp;
  </module>
</schema>
