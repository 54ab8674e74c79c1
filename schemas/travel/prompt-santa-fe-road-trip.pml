<!-- A domestic road trip with both parameters filled; no traveller profile is selected. -->
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
