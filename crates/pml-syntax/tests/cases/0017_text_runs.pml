<schema name="runs">
  <module name="same-line">kept verbatim  </module>
  <module name="spaces"> </module>
  <module name="first-line">first line stays
      second
        third
  </module>
  <module name="blank-middle">
    a

    b
  </module>
  <module name="tabs">
	tab indented
	  more
  </module>
</schema>
