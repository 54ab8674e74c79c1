<prompt schema="longbench-qa">
    <giuseppe-verdi-film/>
    <teatro-giuseppe-verdi/>
    <ferdinando-provesi/>
    <verdi-king-of-melody/>
    Question: Who was Giuseppe Verdi's early tutor, and in which town did he teach him?
    </user>
</prompt>
