<prompt schema="s">
  <user>Question?
    <assistant>Nested answer</assistant>
  </user>
  <system><user>deep</user></system>
</prompt>
