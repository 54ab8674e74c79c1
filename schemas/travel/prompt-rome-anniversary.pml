<!--
  No `duration` argument: the parameter keeps its scaffold text ("one week") from the schema, so the
  cached state of travel-plan is reused as it was encoded.
-->
<prompt schema="travel">
  <travel-plan>
    <overseas>
      <rome/>
    </overseas>
  </travel-plan>
  <couple/>
  <user>
    Our anniversary falls on the fourth day. Suggest a special dinner for that evening, and tell me
    which sights we should book tickets for before we leave home.
  </user>
</prompt>
