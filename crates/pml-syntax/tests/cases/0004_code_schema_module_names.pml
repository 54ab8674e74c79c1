<schema name="code-generation-game">
<system>
You are a sophisticated programmer.
</system>
<user>
Please read the given source files.
<module name="unit.py">
class Unit:
    def __init__(self, hp):
        self.hp = hp

    def alive(self):
        return 0 < self.hp <= 100
</module>
<module name="doc-en-US">Hello</module>
<module name="db:v2.schema_1">x</module>
</user>
</schema>
