<schema name="stray">
  <module name="a">text</module>
  </module>
  </div>
</schema>
</schema>
