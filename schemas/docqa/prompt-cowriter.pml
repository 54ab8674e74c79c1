<!-- Three documents in an order unlike the schema's: positions follow this prompt. -->
<prompt schema="docqa">
  <doctor-strange-film/>
  <sinister-film/>
  <scott-derrickson/>
  <user>Who co-wrote both "Sinister" and "Doctor Strange" with Scott Derrickson?</user>
</prompt>
