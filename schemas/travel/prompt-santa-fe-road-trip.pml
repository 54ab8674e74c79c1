<!-- A domestic road trip; no traveller profile is imported, so that union contributes nothing. -->
<prompt schema="travel">
  <travel-plan duration="a long weekend">
    <domestic city="Santa Fe, New Mexico">
      <road-trip/>
    </domestic>
  </travel-plan>
  <user>
    I'm interested in adobe architecture, Native American art and hot springs. Which scenic drive
    would you pick for the day outside the city, and when should I leave to catch the best light?
  </user>
</prompt>
