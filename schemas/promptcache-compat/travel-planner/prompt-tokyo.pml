<prompt schema="travel-planner">
    <travel-plan duration="3">
        <overseas>
            <tokyo/>
        </overseas>
    </travel-plan>
    <user>Highlight the best food markets, and tell me which day trip is worth it.</user>
</prompt>
