<schema name="eof">
  <module name="m">text</module>
  <module name="n"
