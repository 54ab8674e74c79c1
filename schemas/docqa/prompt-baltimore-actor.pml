<!-- Two facts from two documents; the reversed order shows members need no fixed layout. -->
<prompt schema="docqa">
  <conrad-brooks/>
  <ed-wood/>
  <ed-wood-film/>
  <user>
    Which actor from Ed Wood's films was born in Baltimore, and who played Bela Lugosi in the 1994
    film about Wood?
  </user>
</prompt>
