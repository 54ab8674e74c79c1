<schema name="dup">
  <module name="a" name="b" src="x" src='y'>text</module>
</schema>
