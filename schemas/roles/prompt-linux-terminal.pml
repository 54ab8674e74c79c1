<!-- The smallest useful prompt: one cached role, then the user's first command. -->
<prompt schema="roles">
  <linux-terminal/>
  <user>cat /etc/os-release</user>
</prompt>
