<schema name="chat">
  <system>You help.</system>
  <user>Say hi to <param name="who" len="3"/>.</user>
  <assistant>Hi!</assistant>
  <user/>
</schema>
