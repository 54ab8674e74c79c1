<schema name="docs">
  <system>Answer using the documents.</system>
  <collection name="passages">
    <module name="p1">Paris is the capital of France.</module>
    <module name="p2">Berlin is the capital of Germany.</module>
  </collection>
</schema>
