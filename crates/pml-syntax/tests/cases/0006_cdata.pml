<schema name="cdata">
  <module name="java">
    <![CDATA[
    List<String> names = new ArrayList<>();
    if (a < b && c > d) { names.add("<module>"); }
    ]]>
  </module>
  <module name="inline">Use <![CDATA[<b>]]> for bold; &lt;<![CDATA[&lt;]]>.</module>
</schema>
