<prompt schema="travel">
  <travel-plan duration="a week">
    <overseas>
      <rome/>
    </overseas>
  </travel-plan>
  <personal-touch name="Ana" city='Lisbon'/>
  Plan the trip.
</prompt>
