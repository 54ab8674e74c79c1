<!-- Only two traits are chosen; the other unions are left out of the prompt entirely. -->
<prompt schema='persona'>
    <age>
        <senior/>
    </age>
    <occupation>
        <arts/>
    </occupation>
    <user>
        Describe your ideal weekend, and tell me about the piece of work you are proudest of.
    </user>
</prompt>
