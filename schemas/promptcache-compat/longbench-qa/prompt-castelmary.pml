<prompt schema="longbench-qa">
    <bernhard-botel/>
    <ambroise-thomas/>
    <armand-castelmary/>
    Question: Which French bass created roles in premieres of operas by both Verdi and Ambroise Thomas?
    </user>
</prompt>
