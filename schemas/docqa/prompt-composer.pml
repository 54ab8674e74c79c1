<!-- A bridge question: the composer's document names the band; the others are distractors. -->
<prompt schema="docqa">
  <adam-collis/>
  <deliver-us-from-evil/>
  <tyler-bates/>
  <conrad-brooks/>
  <sinister-film/>
  <user>
    A composer who has collaborated with Scott Derrickson is also the lead guitarist of a rock band.
    Which band?
  </user>
</prompt>
