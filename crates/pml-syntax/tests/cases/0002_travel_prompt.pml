<prompt schema="travel">
  <travel-plan duration="3 days"><overseas><tokyo/></overseas></travel-plan>
  <user>Highlight the surf spots.</user>
</prompt>
