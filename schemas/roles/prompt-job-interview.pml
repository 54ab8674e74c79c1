<!-- A role with a parameter: the position is an argument, the rest of the role is cached. -->
<prompt schema="roles">
  <job-interviewer position="senior data engineer"/>
  <user>Hi, thank you for having me. I'm ready when you are.</user>
</prompt>
