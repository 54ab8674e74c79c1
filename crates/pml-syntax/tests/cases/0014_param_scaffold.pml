<schema name="params">
  <module name="greeting">
    Hello <param name="who" len="4">dear reader</param>, welcome.
    Call me <parameter name="nick" length="3"/>.
    Unvalidated: <param name="x" len="many"/>
  </module>
</schema>
