<schema name="outer">
  <schema name="inner"><module name="a">A</module></schema>
  <module name="b">B</module>
</schema>
