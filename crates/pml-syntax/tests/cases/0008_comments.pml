<!-- header comment before the root is fine -->
<schema name="comments">
  <!-- a comment between elements -->
  <module name="m">
    first line
    <!-- a comment on its own line vanishes with its line -->
    second<!-- inline --> line
    <!-- <module name="commented-out">x</module> -->
  </module>
</schema>
<!-- trailing comment -->
