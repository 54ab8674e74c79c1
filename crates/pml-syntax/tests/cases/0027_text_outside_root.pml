Some notes before the root.
<schema name="s">
  <module name="m">inside</module>
</schema><
trailing words
