<prompt schema="s">
  <travel-plan>
    <overseas>
  </travel-plan>
  Tell me more.
