<!-- Domestic trip: both parameters get arguments; the nested union picks the rail travel style. -->
<prompt schema="travel">
  <travel-plan duration="4 days">
    <domestic city="Chicago">
      <rail/>
    </domestic>
  </travel-plan>
  <family/>
  <user>
    Plan the four days. The children love dinosaurs and trains, and we would like one rainy-day plan
    in case the weather turns. Keep every day's walking under eight kilometres.
  </user>
</prompt>
