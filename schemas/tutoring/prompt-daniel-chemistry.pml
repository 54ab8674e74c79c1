<!-- Same schema, a different path through every union: no module is re-encoded. -->
<prompt schema="tutoring">
  <student name="Daniel" interests="football and designing video games"/>
  <high-school/>
  <chemistry/>
  <intermediate/>
  <kinesthetic/>
  <short-answer/>
  <user>
    He keeps changing subscripts when balancing equations. Plan a 30-minute lesson on balancing
    equations that ends with the combustion of propane, C3H8 + O2 → CO2 + H2O.
  </user>
</prompt>
