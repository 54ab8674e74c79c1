<prompt schema="longbench">
<doc-1/>
<doc-2/>
Question: what do both documents say?
</user>
<assistant>Answer:
</prompt>
