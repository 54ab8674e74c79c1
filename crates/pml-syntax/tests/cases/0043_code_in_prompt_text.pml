<prompt schema="s">
  Why is Vec<u8> not a String?
  Is <T> a type?
  <plan>Plans nest.
</prompt>
