<schema name="empty"/>
