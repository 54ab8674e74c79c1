<schema name="c">
  <module name="a">before <!-- never closed
  </module>
  <module name="b">still here</module>
</schema>
