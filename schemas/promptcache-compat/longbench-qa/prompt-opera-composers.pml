<prompt schema="longbench-qa">
    <parma-airport/>
    <giuseppe-verdi/>
    <ambroise-thomas/>
    <list-of-major-opera-composers/>
    Question: Are Giuseppe Verdi and Ambroise Thomas both opera composers?
    </user>
</prompt>
