<prompt schema="s">
  <user>Hello</system>
  </user>
</prompt>
