<?xml version="1.0" encoding="UTF-8"?>
<schema name="prolog">
  <module name="php"><?php echo "<b>hi</b>"; ?></module>
</schema>
