<schema name="crlf">
  <module name="m">
    line one
    line two
  </module>
</schema>
