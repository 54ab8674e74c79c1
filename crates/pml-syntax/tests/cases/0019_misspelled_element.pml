<schema name="typos">
  <modle name="a">text in a misspelled module</modle>
  <Module name="b">case matters</Module>
  <unoin default="c"></unoin>
  <params name="p" len="2"/>
</schema>
