<schema name=travel>
  <module name=domestic>
    Trip of <param name=days len=5/> days.
  </module>
</schema>
