<schema name="longbench">
<system>Answer questions about the documents.</system>
<user>
Read the following documents.
<module name="doc-1">The first document.</module>
<module name="doc-2">The second document.</module>
</schema>
