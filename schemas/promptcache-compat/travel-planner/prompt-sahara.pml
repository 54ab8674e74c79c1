<prompt schema="travel-planner">
    <travel-plan duration="7">
        <overseas>
            <sahara/>
        </overseas>
    </travel-plan>
    <user>
        Which country should I start from, and what should I pack for the nights in the desert?
    </user>
</prompt>
