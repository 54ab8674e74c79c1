<prompt schema="roles">
  <etymologist/>
  <user>I want to trace the origins of the word "salary". Is the story about Roman soldiers being paid in salt true?</user>
</prompt>
