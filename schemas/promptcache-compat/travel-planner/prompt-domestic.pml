<prompt schema="travel-planner">
    <travel-plan duration="4">
        <domestic city="New Orleans"/>
    </travel-plan>
    <user>I love live jazz and old architecture. Where should I stay?</user>
</prompt>
