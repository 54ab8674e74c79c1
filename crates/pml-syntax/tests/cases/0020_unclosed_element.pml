<schema name="unclosed">
  <module name="a">
    text
  <module name="b">more</module>
</schema>
