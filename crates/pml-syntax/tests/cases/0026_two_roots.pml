<schema name="first">
  <module name="a">A</module>
</schema>
<prompt schema="first"><a/></prompt>
<schema name="third"></schema>
