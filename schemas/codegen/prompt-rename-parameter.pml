<!-- A copy-heavy edit: the answer is utils.py again with one parameter renamed, so nearly every
     token of it is already in the imported module. -->
<prompt schema="codegen">
  <utils.py/>
  <user>
    In utils.py, rename the parameter `position` to `cell` in every function that takes it, and
    update every use of it in those functions. Return the complete new utils.py in one Python code
    block and nothing else.
  </user>
</prompt>
