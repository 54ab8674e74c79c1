<schema name="p">
  <module name="m">
    <param name="x" len="4">before<module name="inner"/>after</param>
  </module>
</schema>
