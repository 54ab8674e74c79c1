<!-- Overseas trip: selects a member of the outer union (overseas), then of its nested union (sydney). -->
<prompt schema="travel">
  <travel-plan duration="5 days">
    <overseas>
      <sydney/>
    </overseas>
  </travel-plan>
  <friends/>
  <user>
    Highlight the surf spots. Which beaches suit beginners and which are for experienced surfers only,
    and where can we rent boards and book a lesson for the two of us who have never surfed?
  </user>
</prompt>
