<schema name="files">
  <module name="readme" src="docs/README.md"/>
  <module name="main.rs" src='src/main.rs' extra="kept for the checker"/>
</schema>
