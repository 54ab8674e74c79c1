<schema name="c">
  <module name="a"><![CDATA[x < y</module>
  <module name="b">still here</module>
</schema>
