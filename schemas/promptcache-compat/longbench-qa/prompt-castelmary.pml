<prompt schema="longbench-qa">
    <bernhard-botel/>
    <armand-castelmary/>
    <ambroise-thomas/>
    Question: Which French bass created roles in premieres of operas by both Verdi and Ambroise Thomas?
    </user>
</prompt>
