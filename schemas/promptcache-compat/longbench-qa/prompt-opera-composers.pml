<prompt schema="longbench-qa">
    <giuseppe-verdi/>
    <parma-airport/>
    <ambroise-thomas/>
    <list-of-major-opera-composers/>
    Question: Are Giuseppe Verdi and Ambroise Thomas both opera composers?
    </user>
</prompt>
