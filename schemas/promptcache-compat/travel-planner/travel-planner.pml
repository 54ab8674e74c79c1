<schema name="travel-planner">

    <system>
        You are a world-renowned travel planner, having curated trips for both the enthusiastic explorer
        and the leisure-seeking traveler. Your understanding of unique travel preferences, combined with
        your extensive knowledge of destinations around the globe, ensures an unforgettable journey.
        Answer with a day-by-day itinerary unless you are asked for something else.
    </system>

    <user>
        <module name="travel-plan">
            I'm gearing up for a memorable escape for <parameter name="duration" length="5" /> days,
            and I would like your help to make the most of every one of them.
            <union scaffold="domestic">
                <module name=domestic>
                    My eyes are set on exploring the diverse tapestry of our own homeland. I've chosen
                    the vibrant city of <parameter name="city" length="10" />. Given its domestic charm,
                    I anticipate an itinerary that beautifully blends affordability with rich
                    experiences. I'm eager to soak in the city's heritage, dine on local delicacies, and
                    meet the people who make it feel like home.
                </module>
                <module name="overseas">
                    I'm yearning to tread international soil, to immerse myself in unfamiliar cultures,
                    sceneries and stories.
                    <union scaffold="tokyo">
                        <module name="maldives">
                            The Maldives beckons with its constellation of coral islands. Known for its
                            luminous lagoons and luxurious over-water villas, it offers an unmatched
                            tropical experience: diving among manta rays, sandbank picnics, and evenings
                            watching bioluminescent plankton glitter along the shore.
                        </module>
                        <module name="amazon">
                            The vast expanse of the Amazon rainforest stirs the adventurer in me. I dream of
                            navigating its winding rivers by canoe, listening to the chorus of the jungle at
                            dawn, spotting pink river dolphins and learning from the communities who have
                            lived in the forest for generations.
                        </module>
                        <module name="sahara">
                            The golden embrace of the Sahara desert is the experience I seek. Beyond its
                            towering dunes lies a world of ancient caravan routes, Berber music and
                            hospitality, camel treks at sunrise and nights around a campfire under a sky
                            crowded with stars.
                        </module>
                        <module name="tokyo">
                            Tokyo, Japan's bustling capital, is a harmonious blend of tradition and
                            modernity. Neon-lit towers rise beside quiet temple gardens, and tiny
                            restaurants serve some of the best food in the world. From the Meiji Shrine to
                            Shibuya Crossing, from sushi counters to tea houses, it promises a whirlwind
                            of experiences.
                        </module>
                        <module name="rome">
                            The eternal city of Rome calls out to the history lover in me. Walking its
                            streets feels like a journey through time, from the Colosseum and the Forum to
                            Renaissance chapels, with a gelato on the Spanish Steps and an evening stroll
                            through Trastevere along the way.
                        </module>
                        <module name="capetown">
                            Cape Town, nestled at the foot of Table Mountain, offers a cocktail of
                            experiences: a layered history, a lively arts scene, beaches, vineyards and the
                            dramatic coastal road to the Cape of Good Hope.
                        </module>
                    </union>
                </module>
            </union>
        </module>
    </user>

    <assistant>
        I'd love to help. I've carefully read your plans and I'm ready to build your itinerary.
    </assistant>

</schema>
