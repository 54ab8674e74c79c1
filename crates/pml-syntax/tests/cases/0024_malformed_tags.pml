<schema name="malformed">
  <module name="unterminated>text</module>
  <module name>no value</module>
  <param name="p" len="3"
  <module name="after">still parsed</module>
  <module name="x" 42>junk attribute</module>
  </module extra="no">
</schema>
