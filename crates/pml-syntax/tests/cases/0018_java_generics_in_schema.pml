<schema name="java">
  <module name="Main.java">
    Map<String, Integer> counts = new HashMap<>();
    List<String> names = List.of("a");
    Optional<Item> first = items.stream().findFirst();
    if (x < y) { return; }
    </Item>
  </module>
</schema>
