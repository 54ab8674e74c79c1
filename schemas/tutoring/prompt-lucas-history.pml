<!-- The `interests` parameter is left without an argument: its positions keep the placeholder. -->
<prompt schema="tutoring">
  <student name="Lucas"/>
  <college/>
  <world-history/>
  <advanced/>
  <reading-writing/>
  <essay/>
  <user>
    The seminar topic is the end of the Western Roman Empire. Set an essay question that makes him
    weigh internal and external causes, and suggest three primary sources he should read first.
  </user>
</prompt>
