<schema name="ünïcödé">
  <module name="日本">東京は日本の首都です。 <param name="名前" len="3"/></module>
  <módulo>kept as text: not a schema element</módulo>
</schema>
