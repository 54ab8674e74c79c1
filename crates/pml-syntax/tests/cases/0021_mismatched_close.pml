<schema name="mismatch">
  <union>
    <module name="a">one
  </union>
  <module name="b">two</module>
</schema>
